"""The node's devices as the plugin sees them between discoveries: view.py (the latest
discovery and the slices it publishes, shared with prepare), health.py (GPU health turned
into taints, health-stream answers and node Events), node_label.py (the Node's
fabric-clique label, kept in step with discovery).
"""
