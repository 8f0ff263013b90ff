"""The shared kernel: schemas, codec, topic specs, state layout, settings, errors."""
