"""Prepare and unprepare, as the DRA socket asks for them.

- preparer.py: Preparer, the driver behind the socket: reads each claim, plans it, runs
  the plan under the node lock and records it in the checkpoint;
- plan.py: pure: a claim's allocation and configs -> what to do on which devices;
- execute.py: the plan's effects (CDI specs, MIG carving, sharing), each step recorded;
- reconcile.py: startup's look at what a crash left half done;
- unprepared.py, claim_status.py, cdi.py: claims unprepared while a prepare ran, the
  claim's status.devices, the CDI spec content and its writer.

May import state/, hardware/ and the core (dradriver.inventory, dradriver.api); the gRPC
edge imports nothing from here (main.py hands it the Preparer).
"""
