"""First launch of the installed app: check the GPU, pick the PyTorch build it can run, install that build
into the user's data folder (with progress, resumable, or offline from a local wheel folder)."""
