"""A DRA kubelet simulator: the kubelet side of the DRA protocol, for one node."""
