"""procrastinate 3.10.0 under fencecheck: its mapping and thin driver."""
