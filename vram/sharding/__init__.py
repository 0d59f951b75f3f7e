"""How several GPUs share the model state: DeepSpeed ZeRO stages and FSDP (1 and 2), what each
GPU keeps of the weights, gradients and optimizer state, and the buffers sharding adds."""
