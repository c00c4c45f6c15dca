"""The package version, read from the installed distribution's metadata."""

from importlib import metadata

try:
    __version__ = metadata.version("autosp")
except metadata.PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0+source"


__all__ = ["__version__"]
