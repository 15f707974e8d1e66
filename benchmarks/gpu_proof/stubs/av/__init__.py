"""A stand-in for PyAV on the lent GPU machine, where the real one (a 36 MB wheel) is not carried.

MAX 26.7 imports `av` at the top of `max.pipelines.context.video` and uses it only to decode video
inputs, which GPT-2 never gets; any use of this stand-in raises ImportError saying so. `on_device.sh`
puts it last on the path, so an installed PyAV wins.
"""


def __getattr__(name: str) -> None:
    raise ImportError(f"av.{name}: PyAV is not installed here (video inputs are unsupported)", name="av")
