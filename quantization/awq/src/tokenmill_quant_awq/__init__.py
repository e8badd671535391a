"""tokenmill's AWQ format plugin: 4-bit GEMM-layout checkpoints and a torch reference kernel."""
