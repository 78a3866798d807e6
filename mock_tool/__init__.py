"""Mock external tool: a separate process with its own durable storage."""
