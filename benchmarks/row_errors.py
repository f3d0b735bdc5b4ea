"""The error of a calibration row that cannot be mapped, shared by ``calibration_rows`` and the
``row_*`` modules it uses."""


class Unmappable(Exception):
    """A row that cannot be turned into a cost-model request; the message says why."""
