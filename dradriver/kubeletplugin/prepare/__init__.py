"""Prepare and unprepare, as the DRA socket asks for them: preparer.py reads each claim,
plans it (plan.py, pure), applies it (execute.py) and records it; reconcile.py finishes
what a crash left. May import state/, hardware/ and the core (dradriver.inventory,
dradriver.api); the gRPC edge imports nothing from here (main.py hands it the Preparer).
See docs/design.md, "Prepare: read, plan, apply, record"."""
