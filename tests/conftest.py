"""Shared by every test folder: this folder is on ``sys.path`` (pytest puts a root conftest's
folder there), so helpers such as :mod:`server_process` import from any test module."""
