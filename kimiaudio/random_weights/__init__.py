"""Random-weight checkpoints in the official layout: the embedded demo (tiny, written to disk by
`serve` on first start and by `demo-checkpoint`) and the shapes the benches build."""
