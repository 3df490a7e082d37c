"""What outlives a turn: its retained result, its callback, its live events (contract §6.6-§6.8)."""
