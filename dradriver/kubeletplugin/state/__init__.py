"""What the node keeps on disk, versioned and tolerant of older and newer formats: the
checkpoint (checkpoint/, records.py and the parts of a record), the ledger of what must
be undone even after a lost checkpoint (ledger.py), the name book (name_book.py), the
file primitives they share (files.py) and the GPUs' locks (ledger.py). Every file the plugin
writes, and the facts in each, one home each: docs/design.md, "What the node writes".

Imports no other package of the plugin: everything else builds on it.
"""
