"""torchflex operator: reconciles ElasticJob objects (kopf). Never imports torch.
Layers, each importing only those below: cli > runtime > kube | planning > render > model."""
