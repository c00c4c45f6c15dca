"""Reference models the compiler is tested on (and ``autosp-train`` trains)."""

from autosp.compiler.models.llama import Llama, LlamaModel, LlamaOutput

__all__ = ["Llama", "LlamaModel", "LlamaOutput"]
