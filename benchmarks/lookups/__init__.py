"""A lookup's time and cost: the kernels' grid, the host path's stages and overlap, the hash,
a captured lookup by rows a call, one lookup probed beside busy neighbours."""
