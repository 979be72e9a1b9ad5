# Cython declarations for spec/state.py (pure-Python mode: the .py stays plain Python and
# runs interpreted without Cython; `make cython` compiles it with these types).
cdef class CowMap(dict):
    cdef public set _own
    cdef public object _copy
    cdef public object _memo
    cdef object _take(self, object k, object v)
    cpdef _take_all(self)
