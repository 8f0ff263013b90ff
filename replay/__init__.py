"""replay: rebuild a processor's state from the log into a new generation."""
