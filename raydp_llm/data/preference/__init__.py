"""Preference pairs (``data.format=preference``): their rendering as TRL's, the encode stage (on the
chat room's encoder), the built-in sample."""
