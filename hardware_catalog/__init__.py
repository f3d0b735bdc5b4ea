"""Hardware catalog: sourced accelerator, network and cluster numbers, validated at load time."""

from hardware_catalog.loader import Catalog, CatalogError, load_catalog, load_catalog_from

__all__ = ["Catalog", "CatalogError", "load_catalog", "load_catalog_from"]
