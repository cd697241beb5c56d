"""The best step by validation, and when to stop looking for a better one.

Rows held out of the training file (`data.hold_out`) are evaluated every
`eval_every_steps`; their loss is the model's loss in standardised units,
averaged over the targets (the units of `train/loss`), after the ensemble's
members are chosen on them (`meshfit/model/selection.py`). The best step
is checkpointed and kept beside the newest checkpoints; with
`early_stopping_evals`, training stops once that many evaluations in a row
have not improved on it. The tracker's state goes into every checkpoint's
meta, so a resumed run stops where the uninterrupted run would have.
"""

import dataclasses
import math


@dataclasses.dataclass
class BestTracker:
  """The best validation loss so far, and how long ago it came.

  Attributes:
    patience: evaluations without improvement that stop training (0: never).
    best_step: the step of the best loss (0: none yet).
    best_loss: the best loss (inf: none yet).
    evals_since_best: evaluations since the best one.
    stopped: training stopped early (a resumed run trains no more steps).
  """
  patience: int = 0
  best_step: int = 0
  best_loss: float = math.inf
  evals_since_best: int = 0
  stopped: bool = False

  def update(self, step: int, loss: float) -> bool:
    """Records an evaluation at `step`; True if it is the best so far."""
    if loss < self.best_loss:
      self.best_step, self.best_loss, self.evals_since_best = step, loss, 0
      return True
    self.evals_since_best += 1
    if self.patience and self.evals_since_best >= self.patience:
      self.stopped = True
    return False

  def to_json(self) -> dict:
    return {'best_step': self.best_step,
            'best_loss': None if math.isinf(self.best_loss)
                         else self.best_loss,
            'evals_since_best': self.evals_since_best,
            'stopped': self.stopped}

  @classmethod
  def from_json(cls, data: dict | None, patience: int) -> 'BestTracker':
    """The tracker a checkpoint recorded (a new one if it recorded none)."""
    if not data:
      return cls(patience)
    loss = data['best_loss']
    return cls(patience, data['best_step'],
               math.inf if loss is None else loss, data['evals_since_best'],
               data['stopped'])
