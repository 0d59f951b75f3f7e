"""What one GPU holds: tensors by bucket, and the memory around them (the caching allocator)."""
