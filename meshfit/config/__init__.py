"""The run config: its types (schema), `parse` and every check of a key
(parsing), dotted-key overrides (overrides), the copy saved in a workdir and
what may change on resume (json_files), and the sizes chosen for a table
(sizing).

May import parallel (the mesh's shape is checked here), input_pipeline and
models. The typed config's public names are re-exported here, so callers
write `from meshfit.config import Config` and `config.parse(...)`.
"""

from meshfit.config.parsing import (KNOWN_DATASETS, LIKELIHOODS,
                                    NUMERIC_EMBEDDINGS, NUMERIC_SCALINGS,
                                    OPTIMIZERS, SCHEDULES, SELECTIONS,
                                    check_column_selection, check_devices,
                                    grid_size, parse)
from meshfit.config.overrides import unknown_key_message, with_overrides
from meshfit.config.schema import (Config, DatasetConfig, MeshConfig,
                                   OptimizerConfig, SweepConfig)

__all__ = ['KNOWN_DATASETS', 'LIKELIHOODS', 'NUMERIC_EMBEDDINGS',
           'NUMERIC_SCALINGS', 'OPTIMIZERS', 'SCHEDULES', 'SELECTIONS',
           'Config', 'DatasetConfig', 'MeshConfig', 'OptimizerConfig',
           'SweepConfig', 'check_column_selection', 'check_devices',
           'grid_size', 'parse', 'unknown_key_message', 'with_overrides']
