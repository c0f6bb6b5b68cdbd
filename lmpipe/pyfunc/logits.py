"""MLflow models-from-code entry of the raw next-token logits model (lmpipe.serving.TokenLogits)."""

from mlflow.models import set_model

from lmpipe.serving import TokenLogits

set_model(TokenLogits())
