from .config import MRPGenerationConfig
from .engine import DecodingEngine, GenerationStats, MRPGenerateOutput
from .sampling import TokenProposer

__all__ = ["DecodingEngine", "GenerationStats", "MRPGenerateOutput", "MRPGenerationConfig", "TokenProposer"]
