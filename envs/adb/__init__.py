"""Android devices over ADB: the host-side env, the emulated device and its shell subset. No jax."""
