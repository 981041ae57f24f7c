"""Zero-touch instrumentation: ``dsec run -- python train.py`` instruments a program that has
no dsec line in it, through a ``sitecustomize`` on its path and import hooks.

Nothing is imported here: the ``sitecustomize`` loads ``dsec.zerotouch.session`` in every
Python process ``dsec run`` starts, and that stays light.
"""
