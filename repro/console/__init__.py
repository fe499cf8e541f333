"""What a long run shows in the terminal while it works: progress lines and expected durations."""
