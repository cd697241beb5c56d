"""The run config: every key is declared once, in configs/default.py; from
the declarations come its types (schema), `parse` and its checks (parsing),
dotted-key overrides (overrides), the reading of keys spelled the old way
(spellings), the copy saved in a workdir and what may change on resume
(json_files), the settings table of docs/usage.md (docs), and the sizes
chosen for a table (sizing).

May import parallel (the mesh's shape is checked here), input_pipeline,
models and configs. The typed config's public names are re-exported here,
so callers write `from meshfit.config import Config` and `config.parse(...)`.
"""

from meshfit.config.parsing import (check_column_selection, check_devices,
                                    grid_size, parse)
from meshfit.config.overrides import unknown_key_message, with_overrides
from meshfit.config.schema import (Config, DatasetConfig, MeshConfig,
                                   OptimizerConfig, SweepConfig)

__all__ = ['Config', 'DatasetConfig', 'MeshConfig', 'OptimizerConfig',
           'SweepConfig', 'check_column_selection', 'check_devices',
           'grid_size', 'parse', 'unknown_key_message', 'with_overrides']
