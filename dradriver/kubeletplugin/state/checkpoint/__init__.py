"""What this node has prepared, kept on disk so that a restarted, upgraded or rebooted
plugin finishes or undoes its work instead of forgetting it.

- records (../records.py): the typed claim and device records and their JSON;
- codec.py: the file's envelope, checksum and the reading of newer formats;
- store.py: loading (never crashing on a bad file) and saving;
- boot.py: what a restart does about the claims it finds.
"""

from dradriver.kubeletplugin.state.checkpoint.boot import (
    BOOT_ID_PATH,
    current_boot_id,
    reconcile_boot,
)
from dradriver.kubeletplugin.state.checkpoint.codec import (
    encode_checkpoint,
    parse_checkpoint,
    payload_checksum,
)
from dradriver.kubeletplugin.state.checkpoint.store import CheckpointStore
from dradriver.kubeletplugin.state.files import CheckpointCorrupt
from dradriver.kubeletplugin.state.records import (
    CURRENT_VERSION,
    PREPARE_COMPLETED,
    PREPARE_STARTED,
    Checkpoint,
    ClaimRecord,
    PreparedDevice,
)

__all__ = [
    "BOOT_ID_PATH",
    "CURRENT_VERSION",
    "PREPARE_COMPLETED",
    "PREPARE_STARTED",
    "Checkpoint",
    "CheckpointCorrupt",
    "CheckpointStore",
    "ClaimRecord",
    "PreparedDevice",
    "current_boot_id",
    "encode_checkpoint",
    "parse_checkpoint",
    "payload_checksum",
    "reconcile_boot",
]
