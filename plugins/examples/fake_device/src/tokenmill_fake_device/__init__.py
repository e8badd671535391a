"""An example tokenmill plugin for a made-up device, "fakedev", whose tensors live on the CPU.

It implements all three plugin interfaces in a few small, commented modules -- the tutorial
source for plugin authors (see plugins/README.md):

* ``platform``  -- ``FakeDevicePlatform``: probe, capabilities, defaults;
* ``attention`` -- ``FakeDeviceAttentionBackend``: paged attention, one request at a time;
* ``quantizer`` and ``kernels`` -- ``FakeInt8Quantizer``: int8 weights with per-channel scales.

Nothing here imports torch at module level: discovery imports these modules in every process.
"""
