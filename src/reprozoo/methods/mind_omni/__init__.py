"""Mind-Omni: unified brain encoding / decoding with masked discrete diffusion, in miniature."""
