# Managed by mlxops (`mlxops provision`, task env): edits here are overwritten.
# Sourced by every rank on this host before it starts. Which backend reads what:
#   OMPI_MCA_btl_tcp_*     mpi backend only (Open MPI's TCP transport); ignored by ring/jaccl
#   MLX_METAL_FAST_SYNCH   Metal (GPU) runs on any backend; 1 = on, and MLX warns it can
#                          leave the GPU wedged, so it is only ever on by inventory choice
#   the rest               mlxops_env from the inventory, for every rank on this host
export OMPI_MCA_btl_tcp_links=4
export OMPI_MCA_btl_tcp_if_include=bridge0
export MLX_METAL_FAST_SYNCH=1
export TOKENIZERS_PARALLELISM=false
export GREETING='it'"'"'s a $(test)'
