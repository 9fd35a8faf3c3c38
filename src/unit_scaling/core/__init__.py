"""Core helpers shared by every unit-scaled op."""
