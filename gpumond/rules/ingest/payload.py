"""The push body's models and checks, as the ingest names them: they live in gpumond/push/body.py, which the
agent's relay imports too, so a push the relay forwards was judged by the same code as one pushed directly."""

from gpumond.push.body import (PayloadError as PayloadError, PushBody as PushBody, Step as Step,
                               columns_model as columns_model, describe as describe, parse as parse,
                               push_model as push_model)
