"""torchflex operator: reconciles ElasticJob objects (kopf). Never imports torch."""
