"""The acceptance matrix: one module per experiment."""
