"""rutster: a telephony gateway that puts AI voice brains on real phone calls.

The repository keeps its packages as top-level folders (``tools/``,
``gateway/``, ``brains/``, ``trunk/``, ``spend/``, ``protocols/``, ``media/``,
``base/``); each is linked into this folder, so they import and install as
``rutster.tools``, ``rutster.gateway``, ... and nothing generic lands at the top
of site-packages.
"""
