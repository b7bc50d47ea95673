"""From declarations to actions: what each stage of each model runs, with which inputs,
parameters and limits, and the key that names its result. Pure: imports declare/ and the
foundations; reads no file but declarations.
"""
