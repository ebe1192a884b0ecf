"""Data and tasks: offline corpora, tokenizers, the prepared-data cache, one file per task.

``get_task(name, **options)`` builds a registered task; ``TASKS`` maps names to classes:
``lm``, ``lm_char`` and ``mlm`` (real text), ``translate`` (real pairs), ``mqar``, ``bind``,
``bind_codes``, ``relation``, ``successor`` and ``successor_causal`` (synthetic, generated on
the fly). See ``base.Task`` for the interface.
"""

from qkvlab.data.base import IGNORE, SPLITS, TASKS, Task, get_task, register
from qkvlab.data.corpus import BIBLES, INSTALL_HINT, MissingSourceError
from qkvlab.data.tokenizers import BOS, EOS, MASK, PAD, SPECIALS, UNK, load_tokenizer

# isort: off
# Importing a task module registers it: this order (the table) is the order of TASKS.
from qkvlab.data.lm import LM, LMChar
from qkvlab.data.mlm import MLM
from qkvlab.data.translate import Translate
from qkvlab.data.mqar import MQAR
from qkvlab.data.bind import Bind
from qkvlab.data.bind_codes import BindCodes
from qkvlab.data.relation import Relation
from qkvlab.data.successor import Successor, SuccessorCausal
# isort: on

__all__ = ["BIBLES", "BOS", "EOS", "IGNORE", "INSTALL_HINT", "LM", "LMChar", "MASK", "MLM", "MQAR",
           "PAD", "SPECIALS", "SPLITS", "TASKS", "UNK", "Bind", "BindCodes", "MissingSourceError",
           "Relation", "Successor",
           "SuccessorCausal", "Task", "Translate", "get_task", "load_tokenizer", "register"]
