"""rutster: a telephony gateway that puts AI voice brains on real phone calls.

The repository keeps its packages as top-level folders (``gateway/``,
``media/``, ``brains/``, ``trunk/``, ``spend/``); each is linked into this
folder, so they import and install as ``rutster.gateway``, ``rutster.media``,
... and nothing generic lands at the top of site-packages.
"""
