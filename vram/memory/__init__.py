"""The bytes of each kind of tensor in one training step: parameter groups, weights,
gradients, optimizer state, activations (layer by layer, the attention kernel, the head and
loss), overhead, and inference for comparison; and the caching allocator that holds them
(`allocator`)."""
