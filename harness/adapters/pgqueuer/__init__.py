"""pgqueuer 1.6.0 under fencecheck: its mapping and thin driver."""
