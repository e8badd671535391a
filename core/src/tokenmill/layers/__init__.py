"""Model building blocks: linear layers backed by quantizer kernels, attention backed by the step's
attention backend, rotary embedding, norms, activations, embeddings, and the contexts models receive."""
