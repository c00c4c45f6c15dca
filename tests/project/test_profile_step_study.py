"""studies/profile_step.py's compute floor: the arithmetic categories of its table, nothing else."""


def test_the_profile_studys_compute_floor_sums_only_the_arithmetic_categories():
    from studies import profile_step

    table = {p: dict.fromkeys(profile_step.CATEGORIES, 1.0) for p in profile_step.PHASES}
    assert profile_step.compute_floor_ms(table) == len(profile_step.PHASES) * len(profile_step.COMPUTE)
    assert set(profile_step.COMPUTE) < set(profile_step.CATEGORIES)
