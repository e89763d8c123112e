"""The warnings a run gives a user, counted: a warning raised at every step is noise, however Python prints it.

Python prints a warning once per code location, until a library touches the warning filters (saving a checkpoint
does), after which it prints it again; so a warning raised at every step shows up every few steps. Counted here is
every raise (`always`), of the categories Python shows a user by default, and every log record of WARNING or above,
from any logger (transformers' and datasets' do not propagate to the root logger).
"""

import logging
import warnings
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field

# hidden from users by Python's default filters (outside __main__), so never printed in a run
HIDDEN_BY_DEFAULT = (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning)


@dataclass
class Recorded:
    raised: list = field(default_factory=list)  # warnings.WarningMessage
    logged: list = field(default_factory=list)  # logging.LogRecord

    def lines(self) -> list[str]:
        return [f"{w.category.__name__}: {w.message} ({w.filename}:{w.lineno})" for w in self.raised] + [
            f"{record.name} {record.levelname}: {record.getMessage()}" for record in self.logged
        ]

    def repeated(self) -> list[str]:
        """Each warning given more than once, with how many times (a raised one keyed on its category and text)."""
        counts = Counter(f"{w.category.__name__}: {w.message}" for w in self.raised)
        counts.update(f"{record.name} {record.levelname}: {record.getMessage()}" for record in self.logged)
        return [f"{count} x {text}" for text, count in counts.items() if count > 1]


class _Collect(logging.Handler):
    def __init__(self, records: list):
        super().__init__(logging.WARNING)
        self.records = records

    def emit(self, record):
        self.records.append(record)


@contextmanager
def recorded_warnings():
    """What the block warns (`Recorded`); the package's own once-per-process filters still apply."""
    from minimind_trl import TRL_VLLM_VERSION_WARNING

    loggers = [logging.getLogger()] + [
        logger for logger in logging.Logger.manager.loggerDict.values()
        if isinstance(logger, logging.Logger) and not logger.propagate
    ]  # fmt: skip
    with warnings.catch_warnings(record=True) as raised:
        recorded = Recorded(raised=raised)
        handler = _Collect(recorded.logged)
        warnings.simplefilter("always")
        for category in HIDDEN_BY_DEFAULT:
            warnings.filterwarnings("ignore", category=category)
        warnings.filterwarnings("once", message=TRL_VLLM_VERSION_WARNING, category=UserWarning)
        for logger in loggers:
            logger.addHandler(handler)
        try:
            yield recorded
        finally:
            for logger in loggers:
                logger.removeHandler(handler)
