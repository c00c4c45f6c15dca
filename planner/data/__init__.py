"""Data files of the planner: the model and hardware catalogs (TOML). A package so that wheels ship them."""
