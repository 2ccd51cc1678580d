"""The node component, `dradriver kubelet-plugin`: the kubelet's sockets, prepare and
unprepare, the node's state on disk and the hardware steps. One package per part, from the
edge inwards: grpc_edge/, prepare/, state/, daemons/, hardware/, imex_binding/,
device_view/, endpoints/; main.py wires them. The map: docs/design.md, "How to read this".
"""
