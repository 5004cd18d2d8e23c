"""cuprope's internal machinery, beneath the public modules.

* ``arrays``: what cuprope needs to know about an array from any framework
* ``checks``: small argument checks shared by the dialect modules
* ``loader``: the kernel sources, their instantiation names, NVRTC modules
* ``launch``: the launch-argument struct, vector width, grid and launch
* ``driver``: launches through the CUDA driver once a plan has run through CuPy
"""
