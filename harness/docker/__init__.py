"""Docker nodes: the local image, one container per node, node faults."""
