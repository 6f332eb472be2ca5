from .config import MRPGenerationConfig
from .engine import DecodingEngine
from .sampling import TokenProposer
from .state import GenerationStats, MRPGenerateOutput

__all__ = ["DecodingEngine", "GenerationStats", "MRPGenerateOutput", "MRPGenerationConfig", "TokenProposer"]
