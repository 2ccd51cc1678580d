"""The node component: registration, DRA gRPC, prepare/unprepare."""
