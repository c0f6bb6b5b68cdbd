"""MLflow models-from-code entry of the registered text model (lmpipe.serving.TextGenerator): nothing is pickled."""

from mlflow.models import set_model

from lmpipe.serving import TextGenerator

set_model(TextGenerator())
