"""vram: how much GPU memory a training run needs, where it goes, and which GPUs hold it."""
