"""The checkpoint reader of the release before the "minReader" field (frozen at commit
41e887a): decode.py, share.py, records.py and the parse path of codec.py, copied as they
were, imports pointed here. Test data, never changed: test_checkpoint_compat.py runs it
on what this release writes, as a node rolled back by one release would."""

from tests.support.previous_release.codec import parse_checkpoint
from tests.support.previous_release.records import CURRENT_VERSION, CheckpointCorrupt

__all__ = ["CURRENT_VERSION", "CheckpointCorrupt", "parse_checkpoint"]
