"""One training step: the moments that can hold the peak (each layer's forward, the loss, the
backward, the optimizer step), the peak over them, and `estimate`."""
