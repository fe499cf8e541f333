"""Model serving: a CPU server speaking vLLM's OpenAI dialect, a vLLM launcher, a tiny offline model.

Import the submodules directly (``repro.serving.cpu_server``, ``repro.serving.engine``, ...); this
package module stays light so that importing it never pulls in torch or vllm.
"""
